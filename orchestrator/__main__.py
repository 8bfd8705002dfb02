from orchestrator.cli import entry_point

entry_point()
