"""One module per command (or group of related commands); each defines `register(cli)`.

Command modules import their services inside the command functions, so `orch --help` stays fast.
"""
