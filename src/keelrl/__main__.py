import sys

from keelrl.cli import main

sys.exit(main())
