"""The pools' calendars: reservations booked ahead, what is held and free per day, no-shows released."""
