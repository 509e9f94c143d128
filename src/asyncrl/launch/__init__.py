"""asyncrl.launch"""
