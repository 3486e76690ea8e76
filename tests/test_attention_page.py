"""sample.py --attention_map=FILE.html, tested in a real browser: headless Chromium (Debian's chromium
and chromium-driver, driven by Selenium) opens the page, clicks tokens and heads, and the weights it
shows must be the model's own, with every later token masked. Skips where no Chromium is installed;
.ci/run installs it."""
import importlib.util
import shutil

import pytest
import torch

from checkpoint import save_checkpoint
from data.tokenizer import CharTokenizer
from helpers import TEXT, check_ok
from model import GPT, GPTConfig

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER and importlib.util.find_spec("selenium")),
                                reason="needs chromium, chromium-driver (apt) and selenium (pip); .ci/run installs them")
ROUNDING = 0.5 / 255 + 0.0005  # the page keeps a byte per weight and shows three decimals


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1200,900"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small char-level model with weights far from uniform attention, as out_dir/ckpt.pt."""
    out = tmp_path_factory.mktemp("out")
    tokenizer = CharTokenizer(TEXT)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    save_checkpoint({"model": model.state_dict(), "model_config": config.__dict__, "tokenizer": tokenizer.meta()},
                    str(out / "ckpt.pt"))
    return out, model, tokenizer


def shown_weights(browser, query):
    """Click token `query`; the weight the page shows on every token, and which tokens it masks."""
    from selenium.webdriver.common.by import By
    spans = browser.find_elements(By.CSS_SELECTOR, "#text .tok")
    spans[query].click()
    return ([float(s.get_attribute("data-weight")) for s in spans],
            ["masked" in s.get_attribute("class").split() for s in spans])


def test_the_page_shows_the_models_own_weights_and_masks_the_future(checkpoint, browser, launch, tmp_path):
    from selenium.webdriver.common.by import By
    out, model, tokenizer = checkpoint
    page = tmp_path / "attn.html"
    proc = check_ok(launch("sample.py", f"--out_dir={out}", "--start=First Citizen:", f"--attention_map={page}",
                           "--max_new_tokens=10", "--device=cpu"))
    assert "2 layers x 2 heads over 24 tokens" in proc.stdout, proc.stdout
    browser.get(page.as_uri())
    tokens = browser.execute_script("return DATA.tokens")
    assert "".join(tokens).startswith("First Citizen:") and len(tokens) == 24  # the prompt and what the model wrote
    with torch.no_grad():
        expected = model.attention_weights(torch.tensor([tokenizer.encode("".join(tokens))]))  # per layer (1, nh, T, T)
    checked = 0
    for layer, head in ((0, 0), (1, 1), (1, 0)):  # the grid picks the head
        browser.find_element(By.CSS_SELECTOR, f'#grid [data-layer="{layer}"][data-head="{head}"]').click()
        for query in (0, 9, 23):
            weights, masked = shown_weights(browser, query)
            want = expected[layer][0, head, query]
            for j in range(24):
                if j > query:
                    assert masked[j] and weights[j] == 0, f"token {j} after query {query} is not masked"
                else:
                    assert not masked[j] and abs(weights[j] - want[j].item()) <= ROUNDING, \
                        (layer, head, query, j, weights[j], want[j].item())
                    checked += 1
    assert checked > 90
    browser.find_element(By.CSS_SELECTOR, '#grid [data-layer="1"][data-head="2"]').click()  # average of heads
    weights, _ = shown_weights(browser, 23)
    average = expected[1][0, :, 23].mean(0)
    assert max(abs(w - a.item()) for w, a in zip(weights, average)) <= ROUNDING
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"], "the page logged errors"
    browser.save_screenshot(str(tmp_path / "attn.png"))
    assert (tmp_path / "attn.png").stat().st_size > 10_000


def test_arrow_keys_move_along_the_text(checkpoint, browser, launch, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    out, _, _ = checkpoint
    page = tmp_path / "attn.html"
    check_ok(launch("sample.py", f"--out_dir={out}", "--start=All:", f"--attention_map={page}", "--max_new_tokens=5"))
    browser.get(page.as_uri())
    shown_weights(browser, 3)
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_LEFT)
    body.send_keys(Keys.ARROW_LEFT)
    query = browser.find_elements(By.CSS_SELECTOR, "#text .tok.query")
    assert [q.get_attribute("data-index") for q in query] == ["1"]
