"""The API's contract, one module per domain: the request bodies it takes, the responses and
events it answers with, as typed models that `/openapi.json` serves by name."""
