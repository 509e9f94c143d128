"""Rollout: generation engines (``engine``), the episode runner (``episode``) and evaluation."""
