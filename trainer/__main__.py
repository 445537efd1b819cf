import sys

from shardbench.trainer.cli import main

sys.exit(main())
