"""``kafka-outbox``: one command line for the topics, the migrations, the services and operators.

It sits above the library and the services: ``relay``, ``checker`` and ``checker.audit`` are
imported inside the subcommands that run them, so an application that installs only the library
(``pip install kafka-outbox``) never needs the services' extras or Spark.
"""

from __future__ import annotations
