"""asyncrl.orchestrator"""
