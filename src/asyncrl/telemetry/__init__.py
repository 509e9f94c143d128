"""asyncrl.telemetry"""
