"""asyncrl.rollout"""
