"""asyncrl.weights"""
