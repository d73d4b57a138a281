"""Approvals a person signed: AP2 Payment Mandates (SD-JWT verifiable credentials) verified at the
boundary and read as the approval of exactly one operation. ``sdjwt`` verifies one SD-JWT (RFC
9901), ``chain`` a presentation (one mandate, or an open mandate and the agent's closed one
under it), ``ap2`` reads the verified claims as terms or a refusal, ``checkout`` reads a Checkout
Mandate as the checkout a payment is bound to (its constraints evaluated), ``receipts`` signs
opgate's answers, ``identity`` is the digest that keys a mandate (one for it and its
signature's twin). All pure; every signature is checked by opgate's one JWS verifier
(proxy/transparency/jws.py).

May import: policy, transparency. Imported by: operations.
"""
