"""Backends that run workers: `local` processes on this machine, or SkyPilot managed jobs."""
