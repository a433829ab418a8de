"""``python -m stylevar.cli``: the `stylevar` command."""
import sys

from stylevar.cli import main

sys.exit(main())
