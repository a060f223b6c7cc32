"""The health step: each GPU measured against its own datasheet (``datasheet``), the
variant its measurements fit (``variant``), and the counters read before and after
the load (``counters``). The node side is ``payload/health/``."""
