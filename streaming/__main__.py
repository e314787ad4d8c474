import sys

from core import memory

memory.use_c_allocator("streaming")  # a long-lived process: what it frees after a burst goes back

from streaming.job import main  # noqa: E402

sys.exit(main())
