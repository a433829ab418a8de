"""The test suite: one folder per package (tests/<package>/, tests/docs/ for the README and the structure);
`pytest -m "not slow"` is the fast lane."""
