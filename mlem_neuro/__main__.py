"""``python -m mlem_neuro`` is the ``mlem-neuro`` command line."""
import sys

from .cli import main

sys.exit(main())
