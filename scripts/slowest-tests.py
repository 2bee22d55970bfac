#!/usr/bin/env python3
"""Names the slowest tests of a nextest run from its JUnit file.

    scripts/slowest-tests.py target/nextest/hourglass/junit.xml [count]
"""
import sys
import xml.etree.ElementTree as ET

path = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
cases = []
for case in ET.parse(path).getroot().iter("testcase"):
    cases.append((float(case.get("time", 0)), f'{case.get("classname")} {case.get("name")}'))
cases.sort(reverse=True)
total = sum(t for t, _ in cases)
print(f"\nThe {min(count, len(cases))} slowest of {len(cases)} tests ({total:.0f} s of test time in all):")
for seconds, name in cases[:count]:
    print(f"{seconds:9.1f} s  {name}")
