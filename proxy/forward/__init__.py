"""Forward-proxy mode: agents configured with ``HTTP_PROXY``/``HTTPS_PROXY``.

listener.py      the forward listener: proxy authentication, what may be reached, the
                 hand-over of each request to the same pipeline as reverse mode
connect.py       CONNECT: TLS interception of inspected hosts, opaque pass-through tunnels
targets.py       pure: which provider or pass-through entry a host:port is, Host agreement
destinations.py  pure address-safety decisions, and the resolver that applies them
ca.py            opgate's own CA and the leaf certificates it issues on the fly
"""
