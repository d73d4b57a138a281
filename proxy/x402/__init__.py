"""x402 at the boundary, pure: reading a ``PAYMENT-REQUIRED`` challenge strictly (challenge),
choosing the one requirement an approval covers (choice), the EIP-3009 authorization whose
nonce is derived from the operation, so one operation can only ever produce one (authorization),
reading ``PAYMENT-RESPONSE`` (settlement), an agent's own ``PAYMENT-SIGNATURE`` checked against
the approval (offered), what a nonce's state proves (nonce_state), and why any is refused
(refusal). No IO: the gate's edge (proxy/gate/x402_pay.py) stores and sends, and
reconciliation (proxy/recovery/x402_state.py) reads the chain.

Needs the optional extra ``opgate[x402]`` (the official ``x402`` SDK, with eth-account); the
gate imports this package only for a rule that declares ``x402:``.

May import: nothing of opgate's. Imported by: gate, recovery.
"""

import contextlib
import sys

# py_ecc, which the EVM signing libraries import, raises the process's recursion limit to
# 100,000 when it is first imported. JSON parsers (the json module's C scanner, pydantic) then
# overflow the C stack on deeply nested input and the process dies, where at the default limit
# they raise RecursionError, which opgate answers as a refusal. So it is first imported here,
# before any module of this package imports it, and the limit put back.
_LIMIT = sys.getrecursionlimit()
try:
    with contextlib.suppress(ImportError):  # the extra is not installed: nothing to import
        import py_ecc  # noqa: F401
finally:
    sys.setrecursionlimit(_LIMIT)
