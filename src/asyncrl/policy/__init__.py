"""asyncrl.policy"""
