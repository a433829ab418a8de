"""Tests of the data tools (data_tools)."""
