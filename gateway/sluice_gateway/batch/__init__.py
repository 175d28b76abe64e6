"""OpenAI's Files and Batches API: files kept per tenant, batches whose lines run through the gateway's own
chat and embeddings path at the batch priority class, claimed with leases so that no line is lost or answered
twice when a replica dies."""
