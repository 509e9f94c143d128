"""asyncrl.trainer"""
