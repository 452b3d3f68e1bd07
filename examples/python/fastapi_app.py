# SPDX-License-Identifier: Apache-2.0
"""A FastAPI payment API made idempotent by the ASGI middleware.

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/fastapi_app.py
    curl -i -X POST localhost:8001/payments -H 'Idempotency-Key: "order-42"' \
         -H 'Content-Type: application/json' -d '{"amount": 100}'
"""

import os
import uuid

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from idemsvc import AsyncClient
from idemsvc.asgi import IdempotencyMiddleware


class Payment(BaseModel):
    amount: int


app = FastAPI()


@app.post("/payments", status_code=201)
async def create_payment(payment: Payment) -> JSONResponse:
    pid = "pay_" + uuid.uuid4().hex[:12]
    return JSONResponse({"id": pid, "amount": payment.amount}, status_code=201,
                        headers={"Location": "/payments/" + pid})


app.add_middleware(IdempotencyMiddleware, client=AsyncClient(
    os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"), os.environ.get("IDEMSVC_API_KEY")))

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8001")))
