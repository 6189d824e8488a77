import { test, expect } from "@playwright/test";
import { watchConsole } from "./browser";

test("hosts page shows the demo fleet and filters it after hydration", async ({ page }) => {
  const errors = watchConsole(page);
  await page.goto("/hosts");

  const cards = page.locator(".host-card");
  await expect(cards).toHaveCount(4);
  await expect(page.locator('[data-host="sim-h100-1"] .simulated')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"] .gpu')).toHaveCount(8);

  // A click before hydration would be lost: wait for the app to take over the page.
  await expect(page.locator("main[data-hydrated=true]")).toBeVisible();

  await page.getByLabel("Pool").selectOption("inference");
  await expect(cards).toHaveCount(2);
  await expect(page.locator(".filters .count")).toHaveText("2 of 4 hosts");
  await expect(page.locator('[data-host="sim-l4-1"]')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"]')).toHaveCount(0);

  await page.getByLabel("Status").selectOption("draining");
  await expect(page.getByText("No host matches these filters.")).toBeVisible();
  await page.getByLabel("Status").selectOption("");

  await page.screenshot({ path: "screenshots/hosts.png", fullPage: true });
  expect(errors).toEqual([]);
});
