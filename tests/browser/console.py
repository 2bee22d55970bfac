"""Drives the web console in a real headless Chromium (Debian's chromium and
chromedriver, through Selenium) and prints what it saw as JSON; the Rust test
(`tests/api/console.rs`) judges it against the API.

    console.py URL OUT_DIR SCENARIO ARGS_JSON

SCENARIO `open`: fleet, paging, filters, a sensor's chart over presets and
time zones, the group chart, the CSV, ingest health, a phone-sized layout.
SCENARIO `auth`: the token prompt, a refused token, a device token's view.
Screenshots go to OUT_DIR. Browser log entries are always returned.
"""

import json
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT = 60


def browser(downloads, tz):
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='hg-chromium-')}",
    ]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option("prefs", {
        "download.default_directory": downloads,
        "download.prompt_for_download": False,
    })
    env = dict(os.environ, TZ=tz)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver", env=env), options=opts)
    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": tz})
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
    return driver


def wait(driver, what, cond):
    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.2).until(lambda d: cond(d))
    except Exception as e:  # noqa: BLE001 - name what was awaited
        raise SystemExit(f"timed out waiting for {what}: {e}")


def rows(driver):
    return driver.execute_script(
        "return [...document.querySelectorAll('#sensors tbody tr')].map(r => ["
        " r.dataset.sensor, r.cells[3].textContent, r.cells[2].textContent])")


def fleet_loaded(driver):
    status = driver.find_element(By.ID, "fleet-status").text
    return status.startswith("Sensors") or status.startswith("No sensors")


def latest_filled(driver):
    return all(v != "…" for _, v, _ in rows(driver))


def chart(driver, key, after_url=None):
    box = "chart" if key == "sensor" else "group-chart"
    url_key = "series" if key == "sensor" else "group"

    def ready(d):
        s = d.execute_script(
            f"const b = document.getElementById('{box}');"
            f"return [b.dataset.state, window.hourglass.urls['{url_key}'] || null];")
        return s[0] == "ready" and s[1] != after_url and s

    wait(driver, f"the {key} chart", ready)
    return driver.execute_script(
        f"const c = window.hourglass.charts['{key}'];"
        f"const b = document.getElementById('{box}');"
        f"return {{url: window.hourglass.urls['{url_key}'], data: c.data, dataset: {{...b.dataset}}, width: b.clientWidth}};")


def click_range(driver, seconds):
    driver.find_element(By.CSS_SELECTOR, f"[data-range='{seconds}']").click()


def scenario_open(driver, url, out, args, downloads):
    seen = {}
    driver.get(url + "/")
    wait(driver, "the fleet", fleet_loaded)
    wait(driver, "the last values", latest_filled)
    wait(driver, "the silent marks", lambda d: d.execute_script(
        "return ['checked', 'failed'].includes(document.querySelector('#sensors tbody').dataset.silent)"))
    seen["silent_check"] = driver.execute_script("return document.querySelector('#sensors tbody').dataset.silent")
    seen["page1"] = rows(driver)
    seen["silent"] = driver.execute_script(
        "return [...document.querySelectorAll('#sensors tbody tr.silent')].map(r => r.dataset.sensor)")
    driver.save_screenshot(os.path.join(out, "fleet.png"))
    driver.find_element(By.ID, "next").click()
    wait(driver, "page 2", lambda d: fleet_loaded(d) and rows(d) and rows(d)[0][0] != seen["page1"][0][0])
    seen["page2"] = [r[0] for r in rows(driver)]
    seen["next_disabled_on_last"] = driver.find_element(By.ID, "next").get_attribute("disabled") is not None
    driver.find_element(By.ID, "prev").click()
    wait(driver, "page 1 again", lambda d: rows(d) and rows(d)[0][0] == seen["page1"][0][0])

    glob = driver.find_element(By.ID, "glob")
    glob.send_keys(args["glob"])
    driver.find_element(By.CSS_SELECTOR, "#fleet-filter button").click()
    wait(driver, "the glob filter", lambda d: fleet_loaded(d) and all(
        r[0].startswith(args["glob"].rstrip("*")) for r in rows(d)))
    seen["glob"] = [r[0] for r in rows(driver)]
    glob.clear()
    driver.find_element(By.ID, "label-filter").send_keys(args["label"])
    driver.find_element(By.CSS_SELECTOR, "#fleet-filter button").click()
    wait(driver, "the label filter", lambda d: fleet_loaded(d) and len(rows(d)) != len(seen["page1"]))
    seen["label"] = [r[0] for r in rows(driver)]
    driver.find_element(By.ID, "label-filter").clear()
    driver.find_element(By.CSS_SELECTOR, "#fleet-filter button").click()
    wait(driver, "the whole fleet again", lambda d: fleet_loaded(d) and rows(d) and rows(d)[0][0] == seen["page1"][0][0])

    # A sensor, by clicking its name in the list.
    driver.find_element(By.CSS_SELECTOR, f"#sensors tr[data-sensor='{args['sensor']}'] button").click()
    charts = {"24h": chart(driver, "sensor")}
    driver.save_screenshot(os.path.join(out, "sensor.png"))
    for name, seconds in [("7d", 604800), ("400d", 34560000)]:
        before = charts[list(charts)[-1]]["url"]
        click_range(driver, seconds)
        charts[name] = chart(driver, "sensor", before)
    before = charts["400d"]["url"]
    Select(driver.find_element(By.ID, "tz")).select_by_value("UTC")
    charts["400d-utc"] = chart(driver, "sensor", before)
    before = charts["400d-utc"]["url"]
    click_range(driver, 2592000)
    charts["30d-utc"] = chart(driver, "sensor", before)
    click_range(driver, 3600)
    charts["1h-utc"] = chart(driver, "sensor", charts["30d-utc"]["url"])
    # A custom range, typed in the chosen zone (UTC here).
    click_range(driver, "custom")
    for key, value in zip(("from", "to"), args["custom"]):
        driver.execute_script("document.getElementById(arguments[0]).value = arguments[1]", key, value)
    driver.find_element(By.CSS_SELECTOR, "#custom button").click()
    charts["custom-utc"] = chart(driver, "sensor", charts["1h-utc"]["url"])
    seen["charts"] = charts

    Select(driver.find_element(By.ID, "group-by")).select_by_value("label.site")
    seen["group"] = chart(driver, "group")
    driver.save_screenshot(os.path.join(out, "sensor-group.png"))
    # Averages weighted by time, on both charts.
    Select(driver.find_element(By.ID, "weighting")).select_by_value("time")
    seen["weighted"] = chart(driver, "sensor", charts["custom-utc"]["url"])
    seen["weighted_group"] = chart(driver, "group", seen["group"]["url"])
    seen["weighted_caption"] = driver.find_element(By.ID, "chart-caption").text

    driver.find_element(By.ID, "csv").click()

    def downloaded(_):
        done = [f for f in os.listdir(downloads) if f.endswith(".csv")]
        return done and done[0]

    name = wait(driver, "the CSV download", downloaded)
    with open(os.path.join(downloads, name), encoding="utf-8") as f:
        seen["csv"] = {"name": name, "text": f.read(), "url": driver.execute_script("return window.hourglass.urls.series")}

    def health(d):
        s = d.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#stats dd')].map(e => [e.id, e.textContent]))")
        return s["stat-rate"] not in ("–", "") and s["stat-dead"] not in ("–", "") and s
    seen["health"] = wait(driver, "the health figures", health)
    seen["routes"] = driver.execute_script(
        "return document.getElementById('routes-box').hidden ? null : "
        "[...document.querySelectorAll('#routes tbody tr')].map(r => [...r.children].map(c => c.textContent))")
    seen["dead_letters"] = driver.execute_script(
        "return [...document.querySelectorAll('#dead-letters li')].map(e => e.textContent)")

    seen["unlabelled_controls"] = driver.execute_script(
        "return [...document.querySelectorAll('input, select')]"
        ".filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.id)")
    # Keyboard: a sensor's name takes focus and opens it with Enter.
    seen["sensor_link_tag"] = driver.execute_script(
        "const b = document.querySelector('#sensors tbody button'); b.focus();"
        "return [document.activeElement === b, b.tagName];")

    driver.set_window_size(390, 844)
    time.sleep(0.5)
    seen["phone_overflow"] = driver.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth")
    driver.save_screenshot(os.path.join(out, "phone.png"))
    return seen


def scenario_auth(driver, url, out, args, _downloads):
    seen = {}
    driver.get(url + "/")
    wait(driver, "the token prompt", lambda d: d.execute_script("return document.getElementById('login').open"))
    seen["prompted"] = True
    seen["rows_before_token"] = len(rows(driver))
    driver.save_screenshot(os.path.join(out, "token-prompt.png"))
    token = driver.find_element(By.ID, "token")
    token.send_keys(args["wrong_token"])
    driver.find_element(By.ID, "login-submit").click()
    wait(driver, "the refusal", lambda d: "refused" in d.find_element(By.ID, "login-error").text)
    seen["refused"] = driver.find_element(By.ID, "login-error").text
    token = driver.find_element(By.ID, "token")
    token.send_keys(args["device_token"])
    driver.find_element(By.ID, "login-submit").click()
    wait(driver, "the device's fleet", lambda d: fleet_loaded(d) and latest_filled(d))
    seen["rows"] = [r[0] for r in rows(driver)]
    seen["token_kept_in"] = driver.execute_script(
        "return [sessionStorage.getItem('hourglass.token') !== null, localStorage.length]")
    driver.execute_script(f"location.hash = 'sensor={args['own']}'")
    seen["own_chart"] = chart(driver, "sensor")
    driver.execute_script(f"location.hash = 'sensor={args['other']}'")
    wait(driver, "the refusal of another sensor",
         lambda d: "may not read" in d.find_element(By.ID, "sensor-error").text)
    seen["other_error"] = driver.find_element(By.ID, "sensor-error").text
    driver.save_screenshot(os.path.join(out, "device-token.png"))
    return seen


def main():
    url, out, scenario, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    downloads = tempfile.mkdtemp(prefix="hg-downloads-")
    driver = browser(downloads, args.get("tz", "UTC"))
    try:
        seen = {"open": scenario_open, "auth": scenario_auth}[scenario](driver, url, out, args, downloads)
        seen["log"] = driver.get_log("browser")
    except BaseException as e:
        driver.save_screenshot(os.path.join(out, f"{scenario}-failed.png"))
        print(json.dumps({"error": str(e), "log": driver.get_log("browser")}))
        raise
    finally:
        driver.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
