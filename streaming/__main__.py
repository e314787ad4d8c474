import sys

from streaming.job import main

sys.exit(main())
