"""A small service with an Alembic history of its own, written into a temporary directory.

It is what docs/alembic.md's reader has: a package ``shop`` with SQLAlchemy models
(``shop.models.Base``), a ``migrations`` directory from ``alembic init`` (the generic template's
``script.py.mako``) holding two revisions of its own, and the ``env.py`` printed in
docs/alembic.md, taken from the document as it stands, so the tests follow its steps as written.
The Alembic config is built in code, with the options the document puts in ``alembic.ini``.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import alembic
import sqlalchemy as sa
from alembic.config import Config

DOC = Path(__file__).parents[3] / "docs" / "alembic.md"

#: The shop's revisions (ids in Alembic's style; docs/alembic.md quotes the first).
CUSTOMERS_REV = "3f2a9c1d7b10"
ORDERS_REV = "8c41e2b5a6d3"
APP_TABLES = frozenset({"customers", "orders"})
#: The line docs/alembic.md marks in its env.py, once per ``context.configure``.
FILTER_LINE = "            include_object=outbox.migrations.include_object,  # kafka-outbox\n"

MODELS = '''\
"""The shop's models."""

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "customers"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"))
    total_cents: Mapped[int]
'''

#: What the shop's developer adds next, to make a revision of it with autogenerate.
INVOICE_MODEL = """

class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))
"""

REVISIONS = {
    f"{CUSTOMERS_REV}_customers.py": f'''\
"""customers"""

import sqlalchemy as sa
from alembic import op

revision = "{CUSTOMERS_REV}"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "customers",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("customers")
''',
    f"{ORDERS_REV}_orders.py": f'''\
"""orders"""

import sqlalchemy as sa
from alembic import op

revision = "{ORDERS_REV}"
down_revision = "{CUSTOMERS_REV}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("customer_id", sa.Integer(), sa.ForeignKey("customers.id"), nullable=False),
        sa.Column("total_cents", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
''',
}


def doc_block(language: str, containing: str) -> str:
    """The code block of docs/alembic.md in ``language`` that contains ``containing``."""
    blocks = re.findall(rf"^ *```{language}\n(.*?)^ *```$", DOC.read_text(), re.S | re.M)
    found: list[str] = [b for b in blocks if containing in b]
    assert len(found) == 1, f"{len(found)} {language} blocks with {containing!r} in {DOC}"
    return textwrap.dedent(found[0])  # a block in a list item is indented


def documented_env_py() -> str:
    return doc_block("python", "def run_migrations_online")


def forget_modules() -> None:
    """Drop the ``shop`` package from ``sys.modules`` (each test writes its own)."""
    for name in [m for m in sys.modules if m == "shop" or m.startswith("shop.")]:
        del sys.modules[name]


@dataclass
class ShopApp:
    root: Path
    url: str
    output: io.StringIO = field(default_factory=io.StringIO)

    @property
    def migrations(self) -> Path:
        return self.root / "shop" / "migrations"

    @property
    def versions(self) -> Path:
        return self.migrations / "versions"

    def write(self, env_py: str) -> ShopApp:
        self.versions.mkdir(parents=True)
        (self.root / "shop" / "__init__.py").write_text("")
        (self.root / "shop" / "models.py").write_text(MODELS)
        template = Path(alembic.__file__).parent / "templates" / "generic" / "script.py.mako"
        shutil.copy(template, self.migrations / "script.py.mako")
        (self.migrations / "env.py").write_text(env_py)
        for name, text in REVISIONS.items():
            (self.versions / name).write_text(text)
        return self

    def config(self, *, shared: bool) -> Config:
        """The shop's Alembic config; ``shared``: way B of docs/alembic.md, the outbox's revisions
        in its ``version_locations`` (the document's ``alembic.ini``, option for option)."""
        config = Config(stdout=self.output, output_buffer=self.output)
        config.set_main_option("script_location", str(self.migrations))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        config.set_main_option("path_separator", "newline")
        if shared:
            config.set_main_option(
                "version_locations", f"{self.versions}\noutbox.migrations:versions"
            )
        return config

    def label_branch(self) -> None:
        """docs/alembic.md, way B step 3: ``branch_labels = ("shop",)`` in the first revision."""
        first = self.versions / f"{CUSTOMERS_REV}_customers.py"
        text = first.read_text()
        assert "branch_labels = None" in text
        first.write_text(text.replace("branch_labels = None", 'branch_labels = ("shop",)'))

    def add_invoice_model(self) -> None:
        models = self.root / "shop" / "models.py"
        models.write_text(models.read_text() + INVOICE_MODEL)
        forget_modules()  # the next command imports the models afresh, as a new process would

    def tables(self) -> set[str]:
        engine = sa.create_engine(self.url)
        try:
            return set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()

    def recorded(self, version_table: str) -> set[str]:
        """The revisions ``version_table`` records (empty if there is no such table)."""
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                if not sa.inspect(conn).has_table(version_table):
                    return set()
                query = sa.text(f"SELECT version_num FROM {version_table}")
                return set(conn.execute(query).scalars())
        finally:
            engine.dispose()

    def execute(self, statement: str) -> None:
        engine = sa.create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(statement))
        finally:
            engine.dispose()
