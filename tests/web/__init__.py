"""Tests of the web UI and client (web)."""
