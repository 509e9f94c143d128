"""asyncrl.credit"""
