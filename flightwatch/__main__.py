import sys

from flightwatch.cli import main

sys.exit(main())
