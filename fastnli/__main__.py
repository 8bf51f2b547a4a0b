import sys

from fastnli.cli import main

sys.exit(main())
