import sys

from core import memory

memory.use_c_allocator("streaming", keep_pymalloc=True)  # one run's process: pymalloc, glibc tuned for Arrow

from streaming.job import main  # noqa: E402

sys.exit(main())
