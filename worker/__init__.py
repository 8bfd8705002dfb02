"""The worker: the program that runs on each GPU machine (`python -m worker`)."""
