"""What the test modules share (no tests here): oracles, tiny checkpoint writers and builders, the
one-line error checks, the readers' conformance check (``conformance.py``) and the golden dump
(``golden.py``, a script)."""
