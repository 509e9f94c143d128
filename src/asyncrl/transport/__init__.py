"""asyncrl.transport"""
