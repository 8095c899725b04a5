"""comlrl: cooperative multi-agent reinforcement learning for teams of LLMs."""

__version__ = "0.1.0"
