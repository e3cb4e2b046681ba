"""Request and response schemas, one module per resource (events, queues, leases, tokens,
schedules, operations) and the shared fields in `fields`. The same classes validate requests and
generate /openapi.json (api.openapi names each component after its class)."""
