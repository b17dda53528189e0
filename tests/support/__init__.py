"""What the test modules share (no tests here): oracles, tiny checkpoint writers and builders, the
one-line error checks, and the golden dump (``golden.py``, a script)."""
