"""asyncrl.cost"""
