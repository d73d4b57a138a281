"""x402 at the boundary, pure: reading a ``PAYMENT-REQUIRED`` challenge strictly (challenge),
choosing the one requirement an approval covers (choice), the EIP-3009 authorization whose
nonce is derived from the operation, so one operation can only ever produce one (authorization),
reading ``PAYMENT-RESPONSE`` (settlement), and why either is refused (refusal). No IO: the
gate's edge (proxy/gate/x402_pay.py) stores and sends.

Needs the optional extra ``opgate[x402]`` (the official ``x402`` SDK, with eth-account); the
gate imports this package only for a rule that declares ``x402:``.

May import: nothing of opgate's. Imported by: gate.
"""
