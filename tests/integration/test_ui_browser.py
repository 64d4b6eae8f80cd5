"""``facefuse ui`` in a real browser (Debian's Chromium, headless, driven by Playwright) against
a real tritonserver: photos fused with INFO shown, bad uploads and a dead server answered on the
page, a video fused with a progress bar and playable, the Live tab fed by Chromium's fake
camera, txt2img. Screenshots go to ``$FACEFUSE_UI_SHOTS`` when set (the README's are taken so).

Skipped where Chromium, Gradio or Playwright is missing, unless ``FACEFUSE_REQUIRE_BROWSER=1``
(set by ``.ci/run``, which installs them): there a missing browser fails.
"""

from __future__ import annotations

import importlib.util
import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.media import write_clip

pytestmark = pytest.mark.integration
CHROMIUM = Path(os.environ.get("FACEFUSE_CHROMIUM", "/usr/lib/chromium/chromium"))


def _require_browser() -> None:
    missing = [m for m in ("gradio", "playwright") if importlib.util.find_spec(m) is None]
    if not CHROMIUM.exists():
        missing.append(str(CHROMIUM))
    if missing:
        if os.environ.get("FACEFUSE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests need {missing}")
        pytest.skip(f"browser tests need {missing}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(url: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False")
    process = subprocess.Popen(
        [sys.executable, "-m", "facefuse.cli", "ui", "--url", url, "--port", str(port), *extra],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"facefuse ui exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(base, timeout=2)
            return process, base
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError(f"facefuse ui did not answer in 90 s: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def write_y4m(path: Path, frames: list[np.ndarray], rate: int = 10) -> Path:
    """A YUV4MPEG2 (C420jpeg) file, what Chromium's fake camera plays (and loops)."""
    import cv2

    height, width = frames[0].shape[:2]
    with open(path, "wb") as out:
        out.write(f"YUV4MPEG2 W{width} H{height} F{rate}:1 Ip A1:1 C420jpeg\n".encode())
        for rgb in frames:
            out.write(b"FRAME\n" + cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).tobytes())
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, sample_images):
    """A and B as files, a text file, a photo without a face, a clip and a fake camera, all
    made here from the photos that ship in installed wheels."""
    from facefuse.face.imageio import decode_image

    folder = tmp_path_factory.mktemp("ui-files")
    source, target = sample_images
    (folder / "a.jpg").write_bytes(source)
    (folder / "b.png").write_bytes(target)
    (folder / "notes.txt").write_text("this is not an image\n")
    Image.fromarray(np.full((256, 256, 3), 120, np.uint8)).save(folder / "blank.png")
    rgb = decode_image(target, "B")  # 512 x 512, the astronaut's face ~170 px wide
    small = np.asarray(Image.fromarray(rgb).resize((320, 320)))
    panned = [np.ascontiguousarray(np.roll(small, 3 * i, axis=1)) for i in range(8)]
    write_clip(folder / "clip.mp4", panned, rate=10)
    camera = np.full((360, 480, 3), 40, np.uint8)
    frames = []
    for i in range(20):
        frame = camera.copy()
        frame[:, 60 + 2 * i : 60 + 2 * i + 360] = np.asarray(
            Image.fromarray(rgb).resize((360, 360))
        )
        frames.append(frame)
    write_y4m(folder / "camera.y4m", frames)
    return folder


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("FACEFUSE_UI_SHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("ui-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def ui(request, tmp_path_factory):
    """The page on the tests' tiny-model server, or on ``$FACEFUSE_UI_SERVER`` (a gRPC address:
    the README's screenshots are taken on the exported default)."""
    _require_browser()
    url = os.environ.get("FACEFUSE_UI_SERVER") or request.getfixturevalue("server").grpc_url
    process, base = start_ui(url, tmp_path_factory.mktemp("ui") / "ui.log")
    yield base
    stop(process)


@pytest.fixture(scope="module")
def browser(files):
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                  f"--use-file-for-fake-video-capture={files / 'camera.y4m'}"],
        )  # fmt: skip
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, ui):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.goto(ui, wait_until="load")
    yield page
    context.close()


def shown_image(page, selector: str) -> np.ndarray:
    """The pixels of the ``img`` the page shows in ``selector``, fetched from the page's URL."""
    source = page.locator(f"{selector} img").first.get_attribute("src")
    if source.startswith("/") or not source.startswith("http"):
        source = page.url.rstrip("/") + "/" + source.lstrip("/")
    body = page.request.get(source).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


def wait_text(page, selector: str, wanted: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = page.locator(selector).inner_text()
        if wanted in text:
            return text
        time.sleep(0.25)
    raise AssertionError(f"{selector} never said {wanted!r}; it says {text!r}")


def test_a_photo_pair_is_fused_and_info_shown_as_a_person_reads_it(page, files, shots):
    from facefuse.face.detect import find_face

    page.locator("#a input[type=file]").set_input_files(str(files / "a.jpg"))
    page.locator("#b input[type=file]").set_input_files(str(files / "b.png"))
    page.locator("#instruction textarea").fill("make her smile, keep the hair")
    page.locator("#fuse").click()
    wait_text(page, "#status", "Done.")
    info = wait_text(page, "#info", "CLIP tokens")
    for words in ("after compression", "cached prefix tokens", "steps", "Served by", "Faces", "ms"):
        assert words in info, info
    page.locator("#out img").wait_for(timeout=30_000)
    fused = shown_image(page, "#out")
    target = np.asarray(Image.open(files / "b.png").convert("RGB"))
    assert fused.shape == target.shape
    face = find_face(target)
    x0, y0, x1, y1 = face.box
    changed = np.abs(fused.astype(int) - target.astype(int)).max(axis=2) > 8
    assert changed[y0:y1, x0:x1].mean() > 0.05  # A's face at B's place
    assert changed.mean() < 0.5  # the rest is B's
    assert find_face(fused) is not None
    page.screenshot(path=str(shots / "ui-photo.png"), full_page=True)


def test_bad_uploads_get_the_services_message_on_the_page(page, files, shots):
    page.locator("#a input[type=file]").set_input_files(str(files / "notes.txt"))
    toast = page.locator(".toast-body").first
    toast.wait_for(timeout=20_000)
    assert "Invalid file type" in toast.inner_text()
    page.locator("#a input[type=file]").set_input_files(str(files / "a.jpg"))
    page.locator("#b input[type=file]").set_input_files(str(files / "blank.png"))
    page.locator("#fuse").click()
    status = wait_text(page, "#status", "no face found")
    assert "TARGET_IMAGE" in status and "Traceback" not in page.content()
    page.screenshot(path=str(shots / "ui-no-face.png"), full_page=True)
    page.locator("#b input[type=file]").set_input_files(str(files / "b.png"))
    page.locator("#fuse").click()  # the page keeps working
    wait_text(page, "#status", "Done.")


def test_a_video_is_fused_with_progress_and_plays_in_the_page(page, files, shots):
    page.locator("#a input[type=file]").set_input_files(str(files / "a.jpg"))  # A: every tab's
    page.get_by_role("tab", name="Video").click()
    page.locator("#vb input[type=file]").set_input_files(str(files / "clip.mp4"))
    page.locator("#vb video").wait_for(timeout=30_000)
    page.locator("#vfuse").click()
    status = wait_text(page, "#vstatus", "Done", timeout_s=240)
    assert "8 frames" in status and "sound kept" in status, status
    video = page.locator("#vout video")
    video.wait_for(timeout=30_000)
    deadline = time.monotonic() + 30
    while video.evaluate("v => v.readyState") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert video.evaluate("v => v.readyState") >= 2  # decodable by the browser
    assert video.evaluate("v => v.duration") > 0.5
    page.screenshot(path=str(shots / "ui-video.png"), full_page=True)


def test_the_live_tab_fuses_the_fake_camera(page, files, shots):
    page.locator("#a input[type=file]").set_input_files(str(files / "a.jpg"))
    page.get_by_role("tab", name="Live").click()
    page.locator('#cam [title="grant webcam access"]').first.click()
    start = page.locator('#cam button[aria-label="capture photo"], '
                         '#cam button[aria-label="start recording"]').first  # fmt: skip
    start.wait_for(timeout=20_000)
    start.click()
    stats = wait_text(page, "#lstats", "frames/s delivered", timeout_s=120)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and " 0 fused" in stats:
        stats = page.locator("#lstats").inner_text()
    time.sleep(4)  # a few seconds of stream for a steady rate
    stats = page.locator("#lstats").inner_text()
    fused = shown_image(page, "#lout")
    assert fused.shape == (360, 480, 3)
    page.screenshot(path=str(shots / "ui-live.png"), full_page=True)
    (shots / "ui-live.txt").write_text(stats + "\n")
    delivered = int(stats.split("(")[1].split(" fused")[0])
    assert delivered >= 3, stats


def test_txt2img_tab_generates_a_portrait(page, shots):
    page.get_by_role("tab", name="txt2img").click()
    page.locator("#generate").click()
    wait_text(page, "#tstatus", "Done.")
    assert "Denoising" in page.locator("#tinfo").inner_text()
    assert shown_image(page, "#tout").ndim == 3


def test_a_server_that_is_down_is_said_on_the_page(browser, files, tmp_path):
    process, base = start_ui(f"127.0.0.1:{free_port()}", tmp_path / "ui.log")
    try:
        page = browser.new_page()
        page.goto(base, wait_until="load")
        page.locator("#a input[type=file]").set_input_files(str(files / "a.jpg"))
        page.locator("#b input[type=file]").set_input_files(str(files / "b.png"))
        page.locator("#fuse").click()
        status = wait_text(page, "#status", "No answer from the Triton server", timeout_s=60)
        assert "press the button again" in status
        page.close()
    finally:
        stop(process)


def test_with_a_token_the_page_asks_for_it(browser, server, tmp_path):
    process, base = start_ui(server.grpc_url, tmp_path / "ui.log", "--token", "s3cret")
    try:
        page = browser.new_page()
        page.goto(base, wait_until="load")
        assert page.locator("#fuse").count() == 0  # the login form, not the page
        page.locator("input[type=password]").fill("wrong")
        page.locator("input[type=text]").first.fill("me")
        page.locator("button", has_text="Login").click()
        page.locator("text=Incorrect").first.wait_for(timeout=10_000)
        page.locator("input[type=text]").first.fill("me")  # the form was cleared
        page.locator("input[type=password]").fill("s3cret")
        page.locator("button", has_text="Login").click()
        page.locator("#fuse").wait_for(timeout=20_000)
        page.close()
    finally:
        stop(process)
