"""Maintenance jobs and SQL over the warehouse's Delta tables, run with PySpark and delta-spark.

Retention, compaction, erasure and SQL live here; they grow with the data, so they run on Spark
(`local[*]` by default, any Spark master unchanged). The hot path (engine/, api/) never imports this
package. From engine/ it may import only `engine.store.layout` (table paths and schemas).
"""
