"""Tests of stylevar.pipelines."""
