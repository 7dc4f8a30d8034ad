import sys

from keelrl.cli.main import main

sys.exit(main())
