"""``python -m velocity.cli``, and the application file spark-submit runs as a script.

Absolute imports only: run as a file (with PYTHONSAFEPATH=1, so this folder is not put
first on sys.path) it imports the installed package like any other caller.
"""

import sys

from velocity.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
