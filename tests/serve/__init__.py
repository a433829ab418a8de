"""Tests of the service (serve)."""
