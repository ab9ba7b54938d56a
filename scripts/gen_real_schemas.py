"""The Pydantic part of the real-world schema corpus (__test__/fixtures/real-schemas.json).

Run by scripts/gen_real_schemas.mjs, which reads the JSON this prints on stdout; it is not meant
to be run on its own (but `python scripts/gen_real_schemas.py | head` shows what it makes).
Needs Pydantic 2 with email-validator (`pip install 'pydantic[email]'`) in the Python that runs
it: gen_real_schemas.mjs uses $PYDANTIC_PYTHON, else the bench venv
(~/.cache/expert-runtime/bench-venv/bin/python), else python3.

Each model below is written the way an application would write it (Optional, Literal, enums,
nested models that become $defs/$ref, lists, dicts, constrained types, datetime and email
fields, defaults, a discriminated union, a recursive model); its JSON schema is exactly
`Model.model_json_schema()`, nothing edited.
"""

from __future__ import annotations

import json
import sys
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum, IntEnum
from typing import Annotated, Literal, Optional, Union
from uuid import UUID

import pydantic
from pydantic import BaseModel, EmailStr, Field, HttpUrl, conint, constr


# ---- 1. a user account -----------------------------------------------------------------------
class UserAccount(BaseModel):
    """A registered user of a web application."""

    id: UUID
    username: constr(pattern=r"^[a-z0-9_]{3,20}$")
    email: EmailStr
    full_name: Optional[str] = None
    age: Optional[conint(ge=13, le=120)] = None
    roles: list[Literal["admin", "editor", "viewer"]] = Field(default_factory=lambda: ["viewer"])
    is_active: bool = True
    created_at: datetime


# ---- 2. an invoice with nested models --------------------------------------------------------
class Currency(str, Enum):
    EUR = "EUR"
    USD = "USD"
    GBP = "GBP"


class PostalAddress(BaseModel):
    street: str
    city: str
    postal_code: str = Field(max_length=10)
    country: str = Field(pattern=r"^[A-Z]{2}$", description="ISO 3166-1 alpha-2 country code")


class Customer(BaseModel):
    name: str
    email: EmailStr
    billing_address: PostalAddress


class LineItem(BaseModel):
    description: str
    quantity: int = Field(gt=0)
    unit_price: Decimal = Field(ge=0, decimal_places=2)


class Invoice(BaseModel):
    invoice_number: str = Field(pattern=r"^INV-\d{4,8}$")
    issue_date: date
    due_date: date
    currency: Currency = Currency.EUR
    customer: Customer
    items: list[LineItem] = Field(min_length=1)
    notes: Optional[str] = None


# ---- 3. a meeting ----------------------------------------------------------------------------
class Recurrence(str, Enum):
    none = "none"
    daily = "daily"
    weekly = "weekly"
    monthly = "monthly"


class Meeting(BaseModel):
    title: str = Field(max_length=100)
    start: datetime
    duration: timedelta
    organizer: EmailStr
    attendees: list[EmailStr] = []
    location: Optional[str] = None
    video_link: Optional[HttpUrl] = None
    recurrence: Recurrence = Recurrence.none


# ---- 4. a catalog product ---------------------------------------------------------------------
class Dimensions(BaseModel):
    width_cm: float = Field(gt=0)
    height_cm: float = Field(gt=0)
    depth_cm: float = Field(gt=0)
    weight_kg: Optional[float] = Field(default=None, ge=0)


class Product(BaseModel):
    sku: constr(pattern=r"^[A-Z]{3}-\d{5}$")
    name: str = Field(min_length=3, max_length=80)
    description: str
    price: float = Field(gt=0)
    in_stock: int = Field(ge=0)
    tags: set[str] = set()
    attributes: dict[str, str] = {}
    dimensions: Optional[Dimensions] = None


# ---- 5. a review analysis (extraction) -------------------------------------------------------
class ReviewAnalysis(BaseModel):
    product_name: str
    rating: Annotated[int, Field(ge=1, le=5)]
    sentiment: Literal["positive", "neutral", "negative"]
    pros: list[str] = Field(default_factory=list, max_length=5)
    cons: list[str] = Field(default_factory=list, max_length=5)
    summary: str = Field(max_length=280)
    would_recommend: bool


# ---- 6. a discriminated union ----------------------------------------------------------------
class Cat(BaseModel):
    pet_type: Literal["cat"]
    name: str
    indoor: bool = True


class Dog(BaseModel):
    pet_type: Literal["dog"]
    name: str
    breed: Optional[str] = None
    good_with_kids: bool


class Bird(BaseModel):
    pet_type: Literal["bird"]
    name: str
    can_talk: bool = False


class PetAdoption(BaseModel):
    adopter_name: str
    adopter_email: EmailStr
    pet: Annotated[Union[Cat, Dog, Bird], Field(discriminator="pet_type")]
    visit_date: date


# ---- 7. a recursive model ---------------------------------------------------------------------
class Employee(BaseModel):
    name: str
    title: str
    email: Optional[EmailStr] = None
    reports: list["Employee"] = []


class OrgChart(BaseModel):
    company: str
    ceo: Employee


# ---- 8. a service's settings -----------------------------------------------------------------
class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class TlsConfig(BaseModel):
    cert_file: str
    key_file: str
    min_version: Literal["1.2", "1.3"] = "1.2"


class ServerSettings(BaseModel):
    host: str = "0.0.0.0"
    port: conint(ge=1, le=65535) = 8080
    workers: int = Field(default=4, ge=1, le=64)
    log_level: LogLevel = LogLevel.info
    allowed_origins: list[HttpUrl] = []
    tls: Optional[TlsConfig] = None
    request_timeout_seconds: float = Field(default=30.0, gt=0, le=600)


# ---- 9. a flight booking ----------------------------------------------------------------------
class Passenger(BaseModel):
    first_name: str
    last_name: str
    date_of_birth: date
    passport_number: Optional[constr(pattern=r"^[A-Z0-9]{6,9}$")] = None


class FlightBooking(BaseModel):
    origin: constr(pattern=r"^[A-Z]{3}$")
    destination: constr(pattern=r"^[A-Z]{3}$")
    departure_date: date
    return_date: Optional[date] = None
    cabin: Literal["economy", "premium_economy", "business", "first"] = "economy"
    passengers: list[Passenger] = Field(min_length=1, max_length=9)
    seat_preference: tuple[Literal["window", "aisle", "middle"], bool] = Field(
        description="(preferred seat, whether to sit together)"
    )


# ---- 10. a bug report --------------------------------------------------------------------------
class Severity(IntEnum):
    trivial = 1
    minor = 2
    major = 3
    critical = 4


class BugReport(BaseModel):
    title: str = Field(min_length=10, max_length=120)
    severity: Severity
    component: Literal["frontend", "backend", "database", "auth", "billing"]
    steps_to_reproduce: list[str] = Field(min_length=1)
    expected_behavior: str
    actual_behavior: str
    environment: dict[str, str] = Field(default_factory=dict, description="e.g. os, browser, app version")
    duplicate_of: Optional[int] = None
    labels: list[str] = []


# ---- 11. a workout log ------------------------------------------------------------------------
class ExerciseSet(BaseModel):
    reps: int = Field(ge=1, le=100)
    weight_kg: Optional[float] = Field(default=None, ge=0, le=500)


class Exercise(BaseModel):
    name: str
    muscle_group: Literal["chest", "back", "legs", "shoulders", "arms", "core", "cardio"]
    sets: list[ExerciseSet] = Field(min_length=1, max_length=10)


class WorkoutLog(BaseModel):
    date: date
    duration_minutes: int = Field(gt=0, le=300)
    exercises: list[Exercise] = Field(min_length=1)
    perceived_exertion: Annotated[int, Field(ge=1, le=10)]
    notes: Optional[str] = Field(default=None, max_length=500)


ENTRIES = [
    ("pydantic_user_account", UserAccount,
     "Create a user account record for Maria Lopez, username maria_l, email maria@example.com, age 34, with the editor role."),
    ("pydantic_invoice", Invoice,
     "Generate an invoice for Acme GmbH in Berlin for 3 hours of consulting at 120 EUR per hour and one software license at 499 EUR, issued on 2024-05-01 and due 30 days later."),
    ("pydantic_meeting", Meeting,
     "Schedule a 45-minute weekly project sync next Monday at 10:00 UTC organized by lead@example.com with two attendees."),
    ("pydantic_product", Product,
     "Create a catalog entry for a handmade oak desk lamp that costs 89.90, with 12 units in stock and its dimensions."),
    ("pydantic_review_analysis", ReviewAnalysis,
     "Analyze this review: 'The headphones sound amazing and the battery lasts forever, but they feel a bit tight after an hour. Still, four stars from me.'"),
    ("pydantic_pet_adoption", PetAdoption,
     "Fill in a pet adoption request: John Smith (john.smith@example.com) wants to adopt a dog named Rex, a labrador who is good with kids, and visit on 2024-07-14."),
    ("pydantic_org_chart", OrgChart,
     "Describe the org chart of a small startup called Nimbus: a CEO with a CTO and a head of sales, and two engineers reporting to the CTO."),
    ("pydantic_server_settings", ServerSettings,
     "Write the settings for a production API server on port 443 with TLS 1.3, 8 workers, warning log level and https://app.example.com as the allowed origin."),
    ("pydantic_flight_booking", FlightBooking,
     "Book a business class round trip from Lisbon (LIS) to New York (JFK) leaving 2024-09-10 and returning 2024-09-20 for two adults who want window seats together."),
    ("pydantic_bug_report", BugReport,
     "File a bug report: the login page shows a blank screen in Safari 17 on macOS after entering the password; it should redirect to the dashboard."),
    ("pydantic_workout_log", WorkoutLog,
     "Log today's gym session: 60 minutes, bench press 3 sets of 8 at 60 kg, squats 3 sets of 10 at 80 kg, and a 10 minute plank routine. It felt like an 8 out of 10."),
]


def main() -> None:
    out = []
    for name, model, prompt in ENTRIES:
        model.model_rebuild()
        out.append({
            "name": name,
            "source": f"pydantic {pydantic.VERSION}: {model.__name__}.model_json_schema()",
            "prompt": prompt,
            "schema": model.model_json_schema(),
        })
    json.dump(out, sys.stdout, indent=None)


if __name__ == "__main__":
    main()
