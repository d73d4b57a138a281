"""An in-memory EIP-3009 token: the only fake in the x402 tests (the chain). It implements the
SDK's ``FacilitatorEvmSigner`` seam, so the SDK's own ``exact`` facilitator verifies and
settles against it: balances, ``authorizationState(authorizer, nonce)``, and
``transferWithAuthorization`` that recovers the signer (real eth-account signatures) and
refuses a used nonce, a window not open or closed, or a short balance, as USDC's contract does.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from eth_account import Account
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.exact.eip3009_utils import ERC20_TRANSFER_EVENT_TOPIC
from x402.mechanisms.evm.types import ExactEIP3009Authorization, TransactionReceipt

CHAIN_ID = 8453
NETWORK = f"eip155:{CHAIN_ID}"
TOKEN = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"  # USDC on Base, as an address only
TOKEN_NAME, TOKEN_VERSION = "USD Coin", "2"


class Reverted(Exception):
    """The token contract's revert, worded as an RPC node reports one ("execution reverted:
    <reason>"), which the SDK maps to its error codes."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"execution reverted: {reason}")


@dataclass(frozen=True)
class Settlement:
    """One transfer the token executed."""

    payer: str
    pay_to: str
    value: int
    nonce: bytes
    tx_hash: str


@dataclass
class Ledger:
    """The token's state, and every transfer it executed (``settlements``)."""

    now: Any  # () -> int: the chain's clock (time.time, or a test's)
    balances: dict[str, int] = field(default_factory=dict)
    used: set[tuple[str, bytes]] = field(default_factory=set)
    settlements: list[Settlement] = field(default_factory=list)
    facilitator: str = "0x000000000000000000000000000000000000fAC1"
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fund(self, address: str, value: int) -> None:
        self.balances[address.lower()] = self.balances.get(address.lower(), 0) + value

    def balance(self, address: str) -> int:
        return self.balances.get(address.lower(), 0)

    def settled_with(self, nonce: str) -> list[Settlement]:
        """The transfers made under ``nonce`` (0x hex)."""
        wanted = bytes.fromhex(nonce.removeprefix("0x"))
        return [s for s in self.settlements if s.nonce == wanted]

    # --- FacilitatorEvmSigner ---

    def get_addresses(self) -> list[str]:
        return [self.facilitator]

    def get_chain_id(self) -> int:
        return CHAIN_ID

    def get_code(self, address: str) -> bytes:
        return b"\x60\x80" if address.lower() == TOKEN.lower() else b""

    def get_balance(self, address: str, token_address: str) -> int:
        return self.balance(address)

    def read_contract(self, address: str, abi: Any, function_name: str, *args: Any) -> Any:
        if function_name == "authorizationState":
            return (str(args[0]).lower(), bytes(args[1])) in self.used
        if function_name == "balanceOf":
            return self.balance(str(args[0]))
        if function_name == "name":
            return TOKEN_NAME
        if function_name == "version":
            return TOKEN_VERSION
        if function_name == "transferWithAuthorization":  # eth_call: checks, no state change
            self._check_transfer(*args)
            return None
        raise Reverted(f"unknown function {function_name}")

    def verify_typed_data(self, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError("EOA signatures are recovered by the SDK itself")

    def write_contract(
        self, address: str, abi: Any, function_name: str, *args: Any, data_suffix: Any = None
    ) -> str:
        if function_name != "transferWithAuthorization":
            raise Reverted(f"unknown function {function_name}")
        with self._lock:
            payer, pay_to, value, nonce = self._check_transfer(*args)
            self.used.add((payer.lower(), nonce))
            self.balances[payer.lower()] -= value
            self.fund(pay_to, value)
            tx_hash = "0x" + hashlib.sha256(b"tx" + nonce + payer.encode()).hexdigest()
            self.settlements.append(Settlement(payer, pay_to, value, nonce, tx_hash))
            return tx_hash

    def send_transaction(self, to: str, data: bytes) -> str:
        raise Reverted("no raw transactions on this ledger")

    def wait_for_transaction_receipt(self, tx_hash: str) -> TransactionReceipt:
        for s in self.settlements:
            if s.tx_hash == tx_hash:
                log = {
                    "address": TOKEN,
                    "topics": [ERC20_TRANSFER_EVENT_TOPIC, _topic(s.payer), _topic(s.pay_to)],
                    "data": "0x" + s.value.to_bytes(32, "big").hex(),
                }
                return TransactionReceipt(status=1, block_number=1, tx_hash=tx_hash, logs=[log])
        raise Reverted(f"no transaction {tx_hash}")

    def _check_transfer(
        self,
        payer: str,
        pay_to: str,
        value: int,
        valid_after: int,
        valid_before: int,
        nonce: bytes,
        v: int,
        r: bytes,
        s: bytes,
    ) -> tuple[str, str, int, bytes]:
        now = self.now()
        if now <= valid_after:
            raise Reverted("FiatTokenV2: authorization is not yet valid")
        if now >= valid_before:
            raise Reverted("FiatTokenV2: authorization is expired")
        if (payer.lower(), bytes(nonce)) in self.used:
            raise Reverted("FiatTokenV2: authorization is used or canceled")
        authorization = ExactEIP3009Authorization(
            from_address=payer,
            to=pay_to,
            value=str(value),
            valid_after=str(valid_after),
            valid_before=str(valid_before),
            nonce="0x" + bytes(nonce).hex(),
        )
        digest = hash_eip3009_authorization(
            authorization, CHAIN_ID, TOKEN, TOKEN_NAME, TOKEN_VERSION
        )
        signer = Account._recover_hash(
            digest, vrs=(v, int.from_bytes(r, "big"), int.from_bytes(s, "big"))
        )
        if signer.lower() != payer.lower():
            raise Reverted("FiatTokenV2: invalid signature")
        if self.balance(payer) < value:
            raise Reverted("ERC20: transfer amount exceeds balance")
        return payer, pay_to, value, bytes(nonce)


def _topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower().removeprefix("0x")
