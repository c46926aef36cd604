"""Implementations of the ops, one module per backend; `jaxnorm.dispatch` picks one."""
