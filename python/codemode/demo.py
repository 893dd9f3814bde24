"""The built-in demo: a small logistics catalog and a cell that searches, calls and joins it.

Run with ``python -m codemode.demo`` (``make demo``). The tools are ordinary Python functions:
one sync, two async, as a host's would be.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated, Any

import msgspec

from .session import CodeMode

__all__ = ["DEMO_CELL", "main", "register_demo_tools"]

CUSTOMERS = [
    {"id": "c1", "name": "Acme Freight", "country": "DE", "tier": "gold"},
    {"id": "c2", "name": "Borealis Foods", "country": "NO", "tier": "silver"},
    {"id": "c3", "name": "Cobalt Mining", "country": "CL", "tier": "gold"},
    {"id": "c4", "name": "Dune Textiles", "country": "MA", "tier": "bronze"},
]
INVOICES = [
    {"id": "i-100", "customerId": "c1", "amount": 12_400.0, "paid": False, "dueDays": 12},
    {"id": "i-101", "customerId": "c1", "amount": 3_100.0, "paid": True, "dueDays": 0},
    {"id": "i-102", "customerId": "c2", "amount": 880.0, "paid": False, "dueDays": 40},
    {"id": "i-103", "customerId": "c3", "amount": 54_000.0, "paid": False, "dueDays": 75},
    {"id": "i-104", "customerId": "c4", "amount": 2_250.0, "paid": True, "dueDays": 0},
]
SHIPMENTS = [
    {"id": "s-1", "customerId": "c1", "tons": 14.5, "status": "in_transit", "paid": False},
    {"id": "s-2", "customerId": "c2", "tons": 3.0, "status": "delivered", "paid": True},
    {"id": "s-3", "customerId": "c3", "tons": 42.0, "status": "delayed", "paid": False},
    {"id": "s-4", "customerId": "c3", "tons": 8.25, "status": "in_transit", "paid": False},
    {"id": "s-5", "customerId": "c4", "tons": 11.0, "status": "delivered", "paid": True},
]


class Invoice(msgspec.Struct, forbid_unknown_fields=True):
    """An invoice as the billing API returns it: a closed shape, so the catalog can promise it."""

    id: str
    customerId: str
    amount: float
    paid: bool
    dueDays: int


def register_demo_tools(cm: CodeMode) -> None:
    """Adds the demo's three tools to ``cm``."""

    @cm.tool(owner="crm")
    def customers_list(tier: str | None = None) -> list[dict[str, Any]]:
        """List customers, optionally only one tier (gold, silver, bronze)."""
        return [c for c in CUSTOMERS if tier is None or c["tier"] == tier]

    @cm.tool(owner="billing")
    async def invoices_list(
        paid: Annotated[bool | None, msgspec.Meta(description="only paid (true) or unpaid (false)")] = None,
    ) -> list[Invoice]:
        """List invoices with amount and days overdue."""
        await asyncio.sleep(0.002)  # a remote billing API
        return [msgspec.convert(i, Invoice) for i in INVOICES if paid is None or i["paid"] == paid]

    @cm.tool(owner="logistics")
    async def shipments_list(status: str | None = None) -> list[dict[str, Any]]:
        """List shipments with tons, status (in_transit, delayed, delivered) and paid flag."""
        await asyncio.sleep(0.002)
        return [s for s in SHIPMENTS if status is None or s["status"] == status]


DEMO_CELL = """\
// Which customers owe us money, how much, and what is still on the road for them?
const [billing] = await tools.search("unpaid invoices");
const [logistics] = await tools.search("shipments status tons");
const [invoices, shipments, customers] = await Promise.all([
  tools.callValue(billing.id, { paid: false }),
  tools.callValue(logistics.id, {}),
  tools.customers_list({}),
]);
const byCustomer = new Map(customers.map((c) => [c.id, c]));
const report = [];
for (const [customerId, owed] of Object.entries(
  invoices.reduce((acc, i) => ({ ...acc, [i.customerId]: (acc[i.customerId] ?? 0) + i.amount }), {}),
)) {
  const open = shipments.filter((s) => s.customerId === customerId && s.status !== "delivered");
  report.push({
    customer: byCustomer.get(customerId).name,
    owed,
    openShipments: open.map((s) => `${s.id} (${s.tons} t, ${s.status})`),
  });
}
report.sort((a, b) => b.owed - a.owed);
text(`${report.length} customers owe ${report.reduce((n, r) => n + r.owed, 0)} in total`);
return { usedTools: [billing.id, logistics.id], report };
"""


def main() -> int:
    with CodeMode() as cm:
        register_demo_tools(cm)
        session = cm.session("demo")
        print("what the model sees (the exec tool's description):\n")
        print(cm.exec_description())
        print("\nthe cell it writes:\n" + DEMO_CELL)
        result = session.exec({"code": DEMO_CELL})
        print("result:")
        print(json.dumps(result, indent=2))
        return 0 if result["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
