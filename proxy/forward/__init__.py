"""Forward-proxy mode: agents configured with ``HTTP_PROXY``/``HTTPS_PROXY``. A front end: each
request it lets through is handed to the gate's pipeline (``proxy.gate.forwarded`` is the
hand-over), so both modes decide alike.

listener.py      the forward listener: proxy authentication, what may be reached, the
                 hand-over of each request to the same pipeline as reverse mode
connect.py       CONNECT: TLS interception of inspected hosts, opaque pass-through tunnels
targets.py       pure: which provider or pass-through entry a host:port is, Host agreement
destinations.py  pure address-safety decisions, and the resolver that applies them
ca.py            opgate's own CA and the leaf certificates it issues on the fly

May import: runtime, gate, observe, policy, store, settings, errors. Imported by: the process
(server).
"""
