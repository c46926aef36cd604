"""Benchmarks and the cost ledger for jaxnorm: predict (ledger), measure (suites), compare."""
