"""asyncrl.envs"""
