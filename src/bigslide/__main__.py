import sys

from bigslide.cli.main import main

sys.exit(main())
