"""The transparency log for reviewers, on the operations listener (admin token, as the rest of
it): the equivalents of ``opgate audit checkpoint|prove|consistency|bundle``.

    GET /v1/audit/checkpoint                      the latest signed checkpoint (text)
    GET /v1/audit/proof?record=STREAM:SEQ[&size=N]   a record's inclusion proof (JSON)
    GET /v1/audit/consistency?old=M&new=N         a consistency proof (JSON)
    GET /v1/audit/bundle?operation=OP             an offline bundle (JSON)

A record, a size or a checkpoint that is not there is a 404 ``audit_not_provable``.
"""

from __future__ import annotations

from aiohttp import web

from proxy.admin.access import admin_problem
from proxy.gate.ids import IdKind, id_rule, valid_id
from proxy.gate.reasons import Reason
from proxy.observe.auditlog import bundle, proofs
from proxy.runtime import GATEWAY


def _size(request: web.Request, name: str, default: int | None = None) -> int | None:
    value = request.query.get(name)
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) >= 2**63:
        raise proofs.NotProvable(f"{name} is a tree size")  # no tree is larger than a bigint
    return int(value)


def _not_provable(exc: Exception) -> web.Response:
    return admin_problem(404, "audit_not_provable", str(exc))


async def audit_checkpoint(request: web.Request) -> web.Response:
    store = request.app[GATEWAY].store
    try:
        text = await store.run(lambda conn: proofs.signed_checkpoint(conn))
    except proofs.NotProvable as exc:
        return _not_provable(exc)
    return web.Response(text=text, content_type="text/plain")


async def audit_proof(request: web.Request) -> web.Response:
    store = request.app[GATEWAY].store
    try:
        stream, seq = proofs.parse_record(request.query.get("record", ""))
        if not valid_id(stream, IdKind.AUDIT_STREAM) or not seq < 2**63:  # no such record
            raise proofs.NotProvable(id_rule(IdKind.AUDIT_STREAM) + "; a seq is a bigint")
        size = _size(request, "size")
        document = await store.run(lambda conn: proofs.inclusion_document(conn, stream, seq, size))
    except proofs.NotProvable as exc:
        return _not_provable(exc)
    return web.json_response(document)


async def audit_consistency(request: web.Request) -> web.Response:
    store = request.app[GATEWAY].store
    try:
        old, new = _size(request, "old", 0), _size(request, "new")
        if old is None or new is None:
            raise proofs.NotProvable("old and new are tree sizes")
        document = await store.run(lambda conn: proofs.consistency_document(conn, old, new))
    except proofs.NotProvable as exc:
        return _not_provable(exc)
    return web.json_response(document)


async def audit_bundle(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    observability = gateway.observability
    signer = observability.signer if observability is not None else None
    operation_id = request.query.get("operation", "")
    if signer is None or not operation_id:
        return _not_provable(proofs.NotProvable("no transparency_key, or no operation named"))
    if not valid_id(operation_id, IdKind.OPERATION):
        return admin_problem(400, Reason.OPERATION_ID_INVALID.value, id_rule(IdKind.OPERATION))
    settings = gateway.settings
    witnesses = [w.vkey for w in settings.audit_witnesses]
    try:
        made = await gateway.store.run(
            lambda conn: bundle.build(
                conn,
                operation_id,
                signer.verifier(),
                witnesses,
                settings.audit_witness_quorum,
                earlier_logs=settings.audit_earlier_log_keys,
            )
        )
    except bundle.BundleError as exc:
        return _not_provable(exc)
    return web.json_response(made)


def add_audit_routes(app: web.Application) -> None:
    app.router.add_get("/v1/audit/checkpoint", audit_checkpoint)
    app.router.add_get("/v1/audit/proof", audit_proof)
    app.router.add_get("/v1/audit/consistency", audit_consistency)
    app.router.add_get("/v1/audit/bundle", audit_bundle)
